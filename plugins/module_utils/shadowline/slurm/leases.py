"""Which cohort registered which discovery lease, so that a cohort whose step ended is fenced at once: its leases
revoked before the frontend routes another request to it."""

from __future__ import annotations

import time

from ..cluster import discovery
from ..common.etcd_client import EtcdError
from .job_state import JobState


class Leases:
    def __init__(self, job: JobState) -> None:
        self.job = job
        self.owner: dict[int, int] = {}  # discovery lease -> cohort that registered it

    def attribute(self, registrations: list[discovery.Registration], live: list[int]) -> None:
        """Attribute each new lease to the cohort that registered it: by the exact match (a real engine's card
        names its cohort's system port), else to the one cohort of ``live`` (waking or serving right now). While
        that is ambiguous (in a failover, before the old primary is seen gone) the lease waits: revoking a lease
        of the wrong cohort would fence the new primary."""
        job = self.job
        plan = job.job_plan
        for reg in registrations:
            if reg.lease in self.owner or (reg.model_name and reg.model_name != plan.model_id):
                continue
            exact = [c.cohort for c in plan.cohorts if reg.system_address == f"{c.leader.address}:{c.ports.system}"]
            owner = exact[0] if exact else (live[0] if len(live) == 1 else None)
            if owner is None:
                continue
            self.owner[reg.lease] = owner
            slot = job.slots.get(f"cohort_{owner}")
            job.events.write("registered", cohort=owner, generation=slot.generation if slot else None,
                             lease=reg.instance_id, request_address=reg.request_address)

    def attribute_to(self, cohort: int) -> None:
        """Every lease registered from ``cohort``'s leader host (the first primary, before anything else runs)."""
        try:
            regs = discovery.registrations(self.job.etcd)
        except EtcdError:
            return
        for reg in regs:
            if reg.host == self.job.job_plan.cohort(cohort).leader.address and reg.lease not in self.owner:
                self.owner[reg.lease] = cohort

    def revoke(self, cohort: int, generation: int) -> None:
        """Fence the dead cohort in discovery: its leases (seen when it registered, or matched exactly) go at once."""
        job = self.job
        started = time.time()
        leases = {lease for lease, owner in self.owner.items() if owner == cohort}
        try:
            leases |= {r.lease for r in discovery.cohort_registrations(job.etcd, job.job_plan, cohort)}
            current = {r.lease for r in discovery.registrations(job.etcd)}
            revoked = discovery.revoke_leases(job.etcd, sorted(leases & current))
        except EtcdError as err:
            job.events.write("revoke-failed", cohort=cohort, generation=generation, error=str(err))
            return
        for lease in leases:
            self.owner.pop(lease, None)
        if revoked:
            job.events.write("revoked", cohort=cohort, generation=generation,
                             leases=[f"{lease:x}" for lease in revoked], revoke_s=round(time.time() - started, 3))
