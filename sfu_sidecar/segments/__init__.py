"""Live media segments on the stream timeline: frames rebuilt from relayed RTP, muxed without
decoding (VP8 + Opus in WebM, H.264 + Opus in fragmented MP4), served over HTTP."""
