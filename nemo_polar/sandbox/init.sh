#!/bin/bash
# Agent sandbox init: relays to the host over the bound Unix sockets, a fail-fast proxy check, then the command.
# The proxy is the only route out; name lookups go to the egress audit, which refuses and records them.
# Grading sandboxes do not run this: they run their command as the image would, with no relay and no audit.
run=/run/polar
port=${POLAR_PROXY_PORT:?init.sh is for sandboxes with a proxy}
unset POLAR_PROXY_PORT
socat UDP4-RECVFROM:53,bind=127.0.0.1,fork UNIX-CONNECT:$run/egress-dns.sock 2>/dev/null &
socat TCP-LISTEN:"$port",bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:$run/proxy.sock 2>/dev/null &
# The relay listens within milliseconds on an idle machine; on a loaded one its start can take seconds, so it is
# waited for up to 30 s (the loop ends as soon as it listens). A relay that finds no proxy still fails at once.
for _ in $(seq 1500); do
  (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break
  sleep 0.02
done
status=""
if exec 3<>/dev/tcp/127.0.0.1/"$port"; then
  # In a subshell: a relay that finds no proxy closes at once, and a write to it must not SIGPIPE the init itself.
  (printf 'GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3) 2>/dev/null
  read -r -t 30 status <&3
  [ $? -gt 128 ] && status="no answer within 30 s"  # a timeout; at the end of the stream (no proxy): no answer
  exec 3<&-
else
  status="the relay to it never listened"
fi
case "$status" in
  *" 200 "*) ;;
  *) echo "polar: the model proxy is not reachable from the sandbox (got: ${status:-no answer})" >&2; exit 97 ;;
esac
exec "$@"
