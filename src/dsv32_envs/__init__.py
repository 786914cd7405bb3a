"""The verifiers plugin of dsv32's environments: verifiers imports the taskset id ``dsv32-envs`` as this
module and takes its ``Taskset`` and ``Harness`` subclasses from ``__all__``.

    vf eval dsv32-envs --env.taskset.env code-interpreter --env.taskset.split heldout ...

The code lives in :mod:`dsv32.interop.verifiers`; ``load_environment`` is re-exported here.
"""

from dsv32.interop.verifiers import DSV32Harness, DSV32Taskset, load_environment

__all__ = ["DSV32Harness", "DSV32Taskset", "load_environment"]
