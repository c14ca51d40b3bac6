"""shadowline: the one library behind the collection, the node agent, the Slurm helpers and the stand-in.

It lives in plugins/module_utils so that Ansible ships it to every host with each module (no install
needed on nodes), and the same directory is the pip-installable package ``shadowline`` (see
pyproject.toml) that daemons and helpers import on nodes. Modules inside it use relative imports only,
so both import names reach the same code, and nothing in it imports Ansible.
"""

__version__ = "0.1.0"
