"""Remediation functions: one folder per function, each with ``handler(event, context)``.

Shared code lives once in ``common/`` and is packaged with every function
(infra/aws/remediation.py builds each archive from the function's folder, ``common/``
and the ``ftfleet`` contract modules). Importing a function's ``config`` module needs
neither boto3 nor pulumi: the Pulumi program renders every function's environment
from it.
"""
