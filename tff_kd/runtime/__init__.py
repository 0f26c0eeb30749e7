"""TFF runtime glue: contexts, remote workers, the driver-side server step.

Nothing here is about an algorithm or a config: it is what it takes to run
TFF 0.87's computations well on this library's machines.

* `context`: the process set-up (`install`), the local C++ runtime's
  context with its worker tuning, and a quiet exit;
* `workers`: TFF's remote runtime on `tff_kd_worker` services;
* `server_stage`: a KD method's server step run by the driver's TensorFlow
  instead of inside the runtime (`runtime.server_device`);
* `aio`: running TFF's coroutines from synchronous code.

The program (`tff_kd.program`) is the only package that imports these.
"""
