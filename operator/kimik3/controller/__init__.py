"""The kopf-based controller: watches, a work queue, reconcile, status, health and metrics."""
