"""firmware_model: the device firmware, a command processor in front of the simulated NPU.

The host writes fixed-size binary command descriptors into a submission ring and rings a
doorbell; the firmware decodes them, tracks their dependencies, dispatches them to DMA channels
and compute cores concurrently, and posts a completion with a status for each. A malformed
command faults its completion and never the simulator; the device stays usable.
"""
