"""Action distributions in the style of RLPD (ikostrikov/rlpd), built on distrax."""

from rlpd_distributions.tanh_normal import TanhDeterministic, TanhNormal
from rlpd_distributions.tanh_transformed import TanhTransformed

__all__ = ['TanhDeterministic', 'TanhNormal', 'TanhTransformed']
