"""Sizing: how many draft nodes a verification should take, priced on the hardware.

Modules: refdec.sizing.budget (the per-request policies, the plain guard, the batch's prefix
solver), refdec.sizing.acceptance (how often each kind of node is accepted, learnt),
refdec.sizing.cost_curve (a verification's measured cost by its size) and refdec.sizing.cost_model
(that curve refit from the steps' timings). Each backend's calibration measures its own curve
(refdec.transformers.calibration, refdec.llama_cpp.calibration).
"""
