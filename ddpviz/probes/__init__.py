"""The rank-side probes: what ddpviz runs inside each rank, beside DDP (its own twin or torch's),
to say what goes wrong before the process group's timeout.

watchdog.py puts a deadline on DDP's waits (bucket all-reduces, buffer broadcasts, the bucket
rebuild) and names a rank that never arrives; pulse.py posts each rank's heartbeat from a
daemon thread and quiet.py names the ranks a step waits for when the wait itself is invisible;
rendezvous.py is the notice board they meet on (the process group's store, never a
collective); where.py reads where the training thread is in code, stack_text.py folds a stack
for people (the launcher's stacks too) and whereabouts.py posts it and names a rank that left
the loop; stuck_stack.py has a rank's stack dumped by faulthandler when its training thread
holds the GIL in C code (thread_state.py adds what the kernel says of that thread).
replicas.py checks that all ranks hold the same bytes after each optimizer step
(digest.py hashes, replica_verdict.py words the verdict); nonfinite.py finds where a NaN/Inf
began; optimizer_step.py times the optimizer step; sync_contract.py checks that each
optimizer step uses gradients DDP all-reduced (no loss on ddp.module, no no_sync() around the
last micro-batch).

watch() (ddpviz/_watch/) builds them around torch's DDP. ddpviz's own DDP gets them through
the twin's interface (engine/observers.py: the protocols of what the twin calls, and the
`Observers` that builds them), which for_twin.py implements; ddpviz/ddp.py plugs it into the
twin as ddpviz.DistributedDataParallel. See [Note: twin and probes] in engine/observers.py.

Probes import the vocabulary, the recording policy and the twin's failure texts and interface;
never UI code, and the twin never imports them (tests/test_layers.py holds both).
"""
