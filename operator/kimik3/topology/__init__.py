"""Accelerator profiles and the parallel plan of one engine group."""
