#!/usr/bin/env bash
# A backstop, not a target: no Python module over 600 lines. Modules are cut
# where the concern changes, never to meet a count (a 300-line rule before this
# produced splits along line counts; issue 21). loadtests/lib/locustfile.py is
# exempt: it must stay one file that imports nothing from the repository, so it
# can be shipped alone to Locust workers.
set -euo pipefail
limit=600
status=0
while IFS= read -r -d '' file; do
  [ "$file" = loadtests/lib/locustfile.py ] && continue
  lines=$(wc -l < "$file")
  if [ "$lines" -gt "$limit" ]; then
    echo "$file: $lines lines (limit $limit): is it still one concern?" >&2
    status=1
  fi
done < <(find gateway tests loadtests testkit -name '*.py' -print0)
exit $status
