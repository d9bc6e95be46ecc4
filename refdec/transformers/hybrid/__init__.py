"""Tree verification on hybrid models: recurrent layers (Gated DeltaNet, Mamba2 mixers, short
convolutions) beside attention layers, or alone.

Attention layers see a draft tree through refdec's tree mask, as in any model. A recurrent
layer carries a state that each token advances in order, so each tree row must get the state
its root-to-node path gives: the tree forms here compute every row's output in one parallel
pass from the request's cached state (the ancestor mask in place of the causal one), and the
state becomes the accepted row's when the step commits, with nothing run again.

Modules:

* ``families`` -- which recurrent families refdec handles, how a model is recognised, the refusals
* ``paths``    -- each tree row's path: its ancestors and its convolution window's columns
* ``conv``     -- the causal depthwise convolution over a tree (every family's short convolution)
* ``delta_rule`` -- the gated delta rule over a tree (Qwen3.5, Qwen3.6, Qwen3-Next)
* ``ssd``      -- the Mamba2 scan over a tree (Mamba2, Granite 4, Bamba, Falcon-H1, Nemotron-H, Zamba2)
* ``state``    -- the recurrent layers in refdec's cache, the pending commits, the row API
* ``step``     -- the model's own forward with its kernels swapped for the tree forms
"""
