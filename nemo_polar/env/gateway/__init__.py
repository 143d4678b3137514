"""The rollout gateway (:mod:`.gateway`), what goes in and out of it (:mod:`.models`), its Prometheus metrics
(:mod:`.metrics`), Ray scale-out over many of them (:mod:`.ray`, imported on its own: it needs a Ray cluster) and
lightweight sessions for load tests (:mod:`.testing`)."""

from nemo_polar.env.gateway.gateway import Gateway, GatewayThread
from nemo_polar.env.gateway.models import GatewayConfig, RecoveryReport, SessionOutcome, SessionRequest

__all__ = ["Gateway", "GatewayConfig", "GatewayThread", "RecoveryReport", "SessionOutcome", "SessionRequest"]
