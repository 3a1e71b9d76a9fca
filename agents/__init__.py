"""Agent registry: `agents[config['agent_name']]` is the class a driver builds."""

from agents.acfql import ACFQLAgent
from agents.acrlpd import ACRLPDAgent

agents = dict(
    acfql=ACFQLAgent,
    acrlpd=ACRLPDAgent,
)
