"""Where a group is, in the worker's book (``_worker.StalenessRolloutWorker._groups``): what a checkpoint does with
each is in ``_checkpoint``."""

RESERVED = "reserved"  # its prompt is taken from the epoch, not yet dispatched (pace: waiting for admission)
IN_FLIGHT = "in_flight"  # dispatched, generating
READY = "ready"  # completed into the buffer, not yet taken
