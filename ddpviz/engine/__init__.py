"""DDP itself, phase by phase, in the order of the walk-through in ddp-facts.md.

ddp.py is `DistributedDataParallel` and wires the phases in order: params.py (1) builds the
parameters DDP reduces and the buffers it syncs; verify.py (2) compares the model across ranks
without ever hanging, over rendezvous.py's store-based exchange; broadcast.py (3) broadcasts
rank 0's state in coalesced chunks; buckets.py (4) derives torch's byte limits and assigns
parameters to buckets exactly as torch's C++ does; reducer.py (5-6) registers the gradient
hooks, fills bucket buffers, all-reduces them (through comm.py's hooks and GradBucket) and
rebuilds the buckets once, its bucket buffers and views in bucket_views.py and every failure
text in failure_texts.py; detail.py holds the recording policy (`ddpviz.Recording`,
`recording=`) and decides which steps record a GradReady per parameter and which a
GradsSummarized per bucket; forward.py is the forward-side work (outputs,
the unused-parameter search); optimizer_step.py times the optimizer step after a sampled
backward (torch's global optimizer-step hooks). Alongside: watchdog.py names lagging or
missing ranks before the process group times out (pulse.py posts its heartbeats from a
daemon thread, and where the training thread is in code when asked: where.py reads the stack,
stack_text.py folds it (the launcher's stacks too), whereabouts.py posts it and names a rank
that left the loop); logger.py keeps torch's logging data; mixed_precision.py,
buffer_identity.py and initial_values.py are the smaller checks and options.

Imports torch and ddpviz's vocabulary (events, findings, errors, limits) only, never UI code
(tests/test_layers.py holds this).
"""
