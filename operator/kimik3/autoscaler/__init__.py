"""Decode-latency autoscaling: metric sources -> windowed quantiles -> policy -> desired groups."""
