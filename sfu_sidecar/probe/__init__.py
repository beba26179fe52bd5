"""The sync probe: timing statistics, alerts, GPU memory telemetry and the operator dashboard.

Modules, pure cores first:

* ``stats``      per published track: RFC 3550 and frame-interval jitter, burstiness,
  discontinuities, the publisher clock fit
* ``viewers``    per viewer: receiver-report jitter, A/V skew played, caption and clock-join error
* ``streams``    what the probe holds per stream (its tracks' statistics, its viewers)
* ``alerts``     named alerts with raise and clear thresholds and minimum durations
* ``gpu``        NVML device samples (behind an import seam) and renderers' allocator reports
* ``exposition`` the Prometheus side, with bounded labels
* ``dashboard``  the push channel of ``/dashboard``
* ``service``    :class:`ProbeService`, the component (relay hooks, ticks, routes)
"""
