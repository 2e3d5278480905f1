"""The part of an agent probe that tries the network: a TCP connect to each target, then one chat
call through the proxy. Shared by the isolation tests (`str.format` with `targets`: braces of the
script itself are doubled)."""

REACH_PROBE = """\
for target in {targets}; do
  if timeout 5 bash -c "exec 3<>/dev/tcp/$target" 2>/dev/null; then echo "TCP_$target=open"
  else echo "TCP_$target=refused"; fi
done
BODY='{{"model": "fake-model", "messages": [{{"role": "user", "content": "hi"}}]}}'
if command -v curl >/dev/null 2>&1; then
  curl -sS -m 30 -o reply.json -H "Authorization: Bearer $OPENAI_API_KEY" \\
    -H 'Content-Type: application/json' -d "$BODY" "$OPENAI_BASE_URL/chat/completions"
else
  BODY="$BODY" python3 -c 'import os, urllib.request as r
headers = {{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
           "Content-Type": "application/json"}}
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
call = r.Request(url, data=os.environ["BODY"].encode(), headers=headers)
open("reply.json", "wb").write(r.urlopen(call, timeout=30).read())'
fi
if grep -q choices reply.json; then echo "PROXY=answered"; else echo "PROXY=failed"; fi
"""
