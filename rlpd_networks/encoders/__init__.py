"""Convolutional encoders for pixel observations."""

from rlpd_networks.encoders.d4pg_encoder import D4PGEncoder

__all__ = ['D4PGEncoder']
