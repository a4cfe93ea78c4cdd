"""The DDP twin: torch's DistributedDataParallel itself, phase by phase, in the order of the
walk-through in ddp-facts.md.

ddp.py is `DistributedDataParallel` and wires the phases in order: params.py (1) builds the
parameters DDP reduces and the buffers it syncs; verify.py (2) compares the model across ranks
without ever hanging; broadcast.py (3) broadcasts rank 0's state in coalesced chunks;
buckets.py (4) derives torch's byte limits and assigns parameters to buckets exactly as torch's
C++ does; reducer.py (5-6) registers the gradient hooks, fills bucket buffers, all-reduces them
(through comm.py's hooks and GradBucket) and rebuilds the buckets once, its bucket buffers and
views in bucket_views.py and every failure text in failure_texts.py; forward.py is the
forward-side work (outputs, the unused-parameter search); logger.py keeps torch's logging data;
compiler.py keeps ddpviz's frames out of torch.compile; mixed_precision.py,
buffer_identity.py and initial_values.py are the smaller options and checks of the
constructor.

What ddpviz watches on each rank while the twin runs (the hang watchdog, the replica and NaN
checks, the optimizer-step tap) lives in ddpviz/probes/, which the twin never imports: it
calls them through observers.py, protocols written from its side that list what it calls
(Guard: start, heartbeat, waiter, wait, failed, fail, agree_on_unused; the replica check's
before_forward, unsynced, after_buffer_sync, after_backward; the NaN check's forward,
checking, bucket, backward_done; the optimizer-step tap's set, disarm), built by the
`Observers` on its class. Alone (NO_OBSERVERS) it has none: plain waits, no checks;
ddpviz.DistributedDataParallel (ddpviz/ddp.py) plugs in the probes' (probes/for_twin.py).
See [Note: twin and probes] in observers.py.

Imports torch and ddpviz's vocabulary (events, findings, errors, limits, the recording policy)
only, never the probes or UI code (tests/test_layers.py holds this).
"""
