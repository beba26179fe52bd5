"""Clients for publishers: WHIP publishing, caption push, clock join."""
