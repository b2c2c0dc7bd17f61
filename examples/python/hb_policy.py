#!/usr/bin/env python3
"""hb_policy.py: acts on a heartbeat monitor's suspicions, one action per level.

The agent publishes one signal per peer, phi, and crosses several levels (`monitor run
--levels`, 1,3,8 by default); what each level means is the consumer's policy. This consumer
runs a shell command when a peer reaches a level and another when it is heard again:

    python3 hb_policy.py --socket /run/heartbeat-monitor.sock \\
        --on '1=logger -t hb "peer $HB_PEER is late (phi $HB_PHI)"' \\
        --on '3=drain-traffic-from "$HB_PEER"' \\
        --on '8=evict "$HB_PEER"' \\
        --on-recover 'undrain "$HB_PEER"'

Each command runs with /bin/sh and these variables: HB_EVENT (`suspect` or `recover`), HB_PEER
(the id), HB_LEVEL (the level reached; for a recovery the highest one acted on) and HB_PHI
(phi when the level was reached; empty for a recovery). It prints one line per action.

Nothing is lost across the gaps a long-running consumer meets (docs/socket-protocol.md):
- started late, or reconnected after the agent restarted, it subscribes first and then asks
  for the suspect set at the lowest level it acts on, so a peer already suspected is acted on
  and a peer that recovered meanwhile gets its recovery;
- told it `lagged` (it read too slowly and events were dropped for it), it asks again;
- every action runs once per peer and level until the peer recovers: a level seen both in the
  suspect set and as an event is acted on once, and levels are acted on lowest first.

Commands run one at a time, in order; a slow one delays the next events (the agent keeps
65,536 of them for each subscriber, then says `lagged`, and this consumer resyncs).

Standard library only, Python 3.9 or later. `--levels-only` prints the policy and exits.

The loop itself is the `heartbeat_monitor` package's (python/ in this repository,
`pip install ./python`, then `hb-policy`); this script runs the repository's copy beside it, or else an
installed one.
"""

import os
import sys

# The repository's package beside this script if there is one, else an installed one.
_repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
if os.path.isdir(os.path.join(_repo, "heartbeat_monitor")):
    sys.path.insert(0, _repo)

from heartbeat_monitor.policy import main  # noqa: E402


if __name__ == "__main__":
    sys.exit(main())
