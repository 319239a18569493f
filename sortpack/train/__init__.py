"""The train-time side of sortpack, one module per concern.

``index`` (a memory-mapped index), ``permutation`` (the keyed shuffle), ``plan`` (epoch order
and the step layout over ranks), ``sampler`` (one rank's micro-batches and resume state),
``lr`` (batch-size LR scaling, ``VariableBatchSizeLR``), ``collate`` (torch collate helpers),
``tokens`` (a micro-batch's token ids from Arrow buffers or items), ``loss`` (``step_loss``).
Only ``lr.VariableBatchSizeLR`` and ``collate`` need torch, imported when used. The public
faces are ``sortpack.reader`` and ``sortpack.torch``.
"""
