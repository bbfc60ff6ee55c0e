"""The KimiK3Deployment API: pydantic models (= the CRD schema), CRD generation, error paths, manifests."""
