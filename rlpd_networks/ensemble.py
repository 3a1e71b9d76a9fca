"""An ensemble of identically shaped networks with independent parameters, evaluated in one vectorized call."""

import flax.linen as nn


class Ensemble(nn.Module):
    """Runs `num` copies of `net_cls` on the same inputs; outputs gain a leading axis of size `num`.

    Params get a leading member axis and are initialized with split rngs, so the members start (and stay) independent.
    """

    net_cls: type[nn.Module]
    num: int = 2

    @nn.compact
    def __call__(self, *args, **kwargs):
        members = nn.vmap(
            self.net_cls,
            variable_axes={'params': 0},
            split_rngs={'params': True, 'dropout': True},
            in_axes=None,
            out_axes=0,
            axis_size=self.num,
        )
        return members()(*args, **kwargs)
