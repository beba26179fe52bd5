"""The sync channel: every viewer's ``sync`` DataChannel fed with the capture time of the frames
it is sent, the stream's epoch and its captions (above the relay, through its observer seam)."""
