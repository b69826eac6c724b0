"""Which ops of a traced graph keep state between calls: the one list, for the two places
that refuse them (a `data.preprocess` function: trainer/loop/preprocess.py; a Task's
steps: trainer/state/task_state.py).

Three kinds: random ops whose state is hidden in the kernel (legacy `tf.random.*`, which
also carry a `seed2` attribute: no checkpoint can hold it, so a resumed run draws other
numbers); random ops whose state is a variable (a `tf.random.Generator`'s; a checkpoint
can hold that variable); and variable writes.
"""

# Legacy random ops and the non-deterministic ones: the state is the kernel's own.
HIDDEN_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop", "SampleDistortedBoundingBox",
    "SampleDistortedBoundingBoxV2", "NonDeterministicInts",
})
# tf.random.Generator's: the state is a variable the op reads and advances.
VARIABLE_RANDOM_OPS = frozenset({
    "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt", "StatefulStandardNormal",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngSkip",
    "RngReadAndSkip",
})
VARIABLE_WRITES = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign", "AssignAdd",
    "AssignSub", "ResourceScatterUpdate", "ResourceScatterAdd", "ResourceScatterSub",
    "ResourceScatterNdUpdate", "ResourceScatterNdAdd", "ScatterUpdate", "ScatterAdd",
})


def first(graph_def, *, variable_random: bool = True, writes: bool = True
          ) -> tuple[str, str] | None:
  """(node name, op) of the first op that keeps state between calls, in the graph or in
  any function it calls (a tf.cond or tf.while_loop body, a Keras layer's call): random
  ops with a hidden state always; a Generator's (`variable_random`) and variable writes
  (`writes`) when asked."""
  ops = HIDDEN_RANDOM_OPS | (VARIABLE_RANDOM_OPS if variable_random else frozenset()) | (
      VARIABLE_WRITES if writes else frozenset())
  nodes = [*graph_def.node, *(node for function in graph_def.library.function
                              for node in function.node_def)]
  for node in nodes:
    if node.op in ops or "seed2" in node.attr:
      return node.name, node.op
  return None
