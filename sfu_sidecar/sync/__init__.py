"""Sync metadata, pure: capture-time mapping of publisher packets, per-viewer records and
batches, and the ``sync`` wire format (proto/sync.md). The relay and the sync channel build on
it."""
