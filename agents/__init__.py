"""Agent registry: `agents[config['agent_name']]` is the class a driver builds.

Each class is imported when first looked up, so a run imports only its own agent (ACRLPD's distributions pull in
TensorFlow Probability, about half a second of every ACFQL run's start otherwise).
"""

import importlib
import sys
from collections.abc import Mapping

_CLASSES = dict(
    acfql=('agents.acfql', 'ACFQLAgent'),
    acrlpd=('agents.acrlpd', 'ACRLPDAgent'),
    qam=('agents.qam', 'QAMAgent'),
    fedit=('agents.fedit', 'FEditAgent'),
    dcgql=('agents.dcgql', 'DCGQLAgent'),
    rebrac=('agents.rebrac', 'ReBRACAgent'),
    dsrl=('agents.dsrl', 'DSRLAgent'),
    cgql=('agents.cgql', 'CGQLAgent'),
    fbrac=('agents.fbrac', 'FBRACAgent'),
    ifql=('agents.ifql', 'IFQLAgent'),
    bam=('agents.bam', 'BAMAgent'),
    fawac=('agents.fawac', 'FAWACAgent'),
)


class _Registry(Mapping):
    def __getitem__(self, name):
        module, cls = _CLASSES[name]
        return getattr(importlib.import_module(module), cls)

    def __iter__(self):
        return iter(_CLASSES)

    def __len__(self):
        return len(_CLASSES)


agents = _Registry()


def agent_module(config):
    """The module of the registered agent `config` names (`config.agent_name`), or None outside the registry (a
    class handed to `Trainer` directly)."""
    name = config.get('agent_name')
    return sys.modules[agents[name].__module__] if name in agents else None
