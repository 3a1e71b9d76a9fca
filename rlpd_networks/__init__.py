"""Networks in the style of RLPD (ikostrikov/rlpd) used by the ACRLPD agent."""

from rlpd_networks.ensemble import Ensemble
from rlpd_networks.mlp import MLP, MLPResNet, MLPResNetBlock, default_init
from rlpd_networks.pixel_multiplexer import PixelMultiplexer
from rlpd_networks.state_action_value import StateActionValue

__all__ = ['MLP', 'Ensemble', 'MLPResNet', 'MLPResNetBlock', 'PixelMultiplexer', 'StateActionValue', 'default_init']
