"""Training-loop helpers beside the reader: the LR scheduler, the step loss, goodput.

What the plan says (steps, their tokens and samples, the LR scale of each) is the reader's
(``sortpack.reader``); what a training loop does with it lives here: ``lr``
(``VariableBatchSizeLR``), ``loss`` (``step_loss``, ``step_targets``), ``goodput`` (the
noise scale and the choice of accumulation, numpy only) and ``goodput_controller``
(``GoodputController``, torch). Same import rules as the reader: numpy and pyarrow, torch
only where used, never MPI or the write side. The public door is ``sortpack.torch``.
"""
