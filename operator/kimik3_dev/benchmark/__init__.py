"""The autoscaler trace benchmark: the fleet simulator, request traces, the peers' rules (``kimik3 simulate``)."""
