"""Speech on the house clock: voice activity, and captions and dubs measured against it."""
