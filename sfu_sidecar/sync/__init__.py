"""Sync metadata: capture time of every forwarded frame, delivered to viewers."""
