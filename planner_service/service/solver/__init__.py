"""Solving requests for the service, off the event loop."""
