"""Usage per tenant for billing: recording rules (``rules``) and the report read from them (``report``)."""
