#!/usr/bin/env bash
# No Python module over 300 lines (issue 9): past that, a module holds more than
# one concern. loadtests/locustfile.py is exempt: it must stay one file that
# imports nothing from the repository, so it can be shipped alone to Locust workers.
set -euo pipefail
limit=300
status=0
while IFS= read -r -d '' file; do
  [ "$file" = loadtests/locustfile.py ] && continue
  lines=$(wc -l < "$file")
  if [ "$lines" -gt "$limit" ]; then
    echo "$file: $lines lines (limit $limit): split it along a seam" >&2
    status=1
  fi
done < <(find gateway tests loadtests -name '*.py' -print0)
exit $status
