#!/usr/bin/env bash
# The OnFailure= handler of stemcell-gallery-cleanup.service (installed as
# /usr/local/bin/stemcell-gallery-alert, run by stemcell-gallery-alert@.service):
#
#   alert.sh UNIT
#
# Reads UNIT's exit status from systemd, logs one line at priority crit to the journal and, when
# ALERT_COMMAND is set, pipes the same line to it (`sh -c "$ALERT_COMMAND"`). Exit 5 from the
# cleanup unit means an evidence source could not be read and nothing was deleted; its cause is
# in the unit's journal.
set -euo pipefail
unit="${1:?usage: $0 UNIT}"
status="$(systemctl show --property ExecMainStatus --value "$unit" 2>/dev/null || echo unknown)"
case "$status" in
  5) why="evidence refused (exit 5): a director's stemcell list or a create-env state could not be read; nothing was deleted" ;;
  1) why="failed (exit 1): a deletion or an Azure request failed; the plan and its errors are in the journal" ;;
  2) why="misconfigured (exit 2): bad flags or configuration" ;;
  *) why="failed (exit status $status)" ;;
esac
message="stemcell-gallery cleanup $unit $why; see journalctl -u $unit"
if command -v systemd-cat >/dev/null; then
  printf '%s\n' "$message" | systemd-cat -t stemcell-gallery-alert -p crit
else
  printf '%s\n' "$message" >&2
fi
if [ -n "${ALERT_COMMAND:-}" ]; then
  printf '%s\n' "$message" | sh -c "$ALERT_COMMAND"
fi
