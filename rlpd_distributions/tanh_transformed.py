"""A distribution squashed into (-1, 1) by an elementwise tanh."""

import distrax
import jax
import jax.numpy as jnp


class TanhTransformed(distrax.Transformed):
    """tanh(X) for a base distribution X with a vector event (e.g. a diagonal Gaussian over a flat action chunk).

    The log-det of tanh uses distrax's overflow-free form 2 (log 2 - x - softplus(-2x)); `sample_and_log_prob`
    evaluates it at the pre-tanh sample, so it stays finite however saturated the sample is. `log_prob` of a
    given value first moves exact +-1 to the nearest representable float inside, where atanh is finite.
    """

    def __init__(self, distribution):
        super().__init__(distribution=distribution, bijector=distrax.Block(distrax.Tanh(), 1))

    def log_prob(self, value):
        """Log-density of `value` (..., A), summed over the event axis."""
        bound = jnp.nextafter(jnp.ones((), jnp.result_type(value)), 0)
        return super().log_prob(jnp.clip(value, -bound, bound))

    def sample_and_log_prob_event_first(self, seed):
        """`sample_and_log_prob` of a diagonal Gaussian base with its noise drawn event axis first, (A, *batch), then
        moved last: the layout in which TensorFlow Probability's `MultivariateNormalDiag` draws, so one key gives
        TFP's samples (the QAM reference's edit policy samples with TFP). The same distribution as
        `sample_and_log_prob`, another arrangement of the same draws."""
        base = self.distribution
        loc, scale = base.loc, base.scale_diag  # (..., A)
        eps = jnp.moveaxis(jax.random.normal(seed, (loc.shape[-1], *loc.shape[:-1]), loc.dtype), 0, -1)
        pre_tanh = loc + scale * eps
        value, log_det = self.bijector.forward_and_log_det(pre_tanh)
        return value, base.log_prob(pre_tanh) - log_det

    def mode(self):
        """tanh of the base mode (for a Gaussian base: the squashed mean)."""
        return jnp.tanh(self.distribution.mode())
