"""Deployment assets, packaged so `cronstream infra` finds the local broker configuration."""
