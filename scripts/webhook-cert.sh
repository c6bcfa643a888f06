#!/usr/bin/env bash
# The conversion webhook's certificate for a cluster without cert-manager:
#
# 1. makes a CA and a serving certificate for the webhook Service's DNS names
#    (gpujob-operator-webhook.gpujob-system.svc[.cluster.local]) with openssl,
# 2. creates or replaces the kubernetes.io/tls Secret gpujob-operator-webhook-tls in
#    gpujob-system (the operator re-reads it without a restart),
# 3. patches the CA into the CRD's spec.conversion.webhook.clientConfig.caBundle.
#
# Run it after `kubectl apply --server-side -k deploy/` (the pods wait for the Secret),
# and again before the certificate expires (DAYS, default 365) to rotate: it makes a
# new CA too and writes the Secret before the caBundle, so there is a short window
# (the kubelet's Secret sync, up to a minute or so) where the API server trusts the new
# CA while a replica may still serve the old certificate and v2 requests fail; run it
# at a quiet time, or use cert-manager (deploy/cert-manager) for overlap-free renewals.
#
# Uses the current kubectl context. NAMESPACE, SERVICE, SECRET, CRD and DAYS override
# the defaults; KEEP_DIR=dir keeps the files (CA key included) there instead of a
# temporary folder that is removed at the end.
set -euo pipefail

namespace="${NAMESPACE:-gpujob-system}"
service="${SERVICE:-gpujob-operator-webhook}"
secret="${SECRET:-gpujob-operator-webhook-tls}"
crd="${CRD:-gpujobs.gpujob.dev}"
days="${DAYS:-365}"

for tool in openssl kubectl base64; do
  command -v "$tool" >/dev/null || { echo "webhook-cert.sh: $tool is needed and not on PATH" >&2; exit 1; }
done

if [[ -n "${KEEP_DIR:-}" ]]; then
  dir="$KEEP_DIR"
  mkdir -p "$dir"
else
  dir="$(mktemp -d)"
  trap 'rm -rf "$dir"' EXIT
fi

dns1="$service.$namespace.svc"
dns2="$service.$namespace.svc.cluster.local"
echo "webhook-cert.sh: CA and serving certificate for $dns1 ($days days) in $dir" >&2

openssl ecparam -name prime256v1 -genkey -noout -out "$dir/ca.key" 2>/dev/null
openssl req -x509 -new -key "$dir/ca.key" -sha256 -days "$days" \
  -subj "/CN=gpujob-operator-webhook-ca" -out "$dir/ca.crt" 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out "$dir/tls.key.ec" 2>/dev/null
# PKCS#8, the form every TLS library reads.
openssl pkcs8 -topk8 -nocrypt -in "$dir/tls.key.ec" -out "$dir/tls.key"
openssl req -new -key "$dir/tls.key" -subj "/CN=$dns1" -out "$dir/tls.csr" 2>/dev/null
cat >"$dir/tls.ext" <<EXT
subjectAltName=DNS:$dns1,DNS:$dns2
extendedKeyUsage=serverAuth
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
EXT
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days "$days" -sha256 -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
openssl verify -CAfile "$dir/ca.crt" "$dir/tls.crt" >/dev/null

echo "webhook-cert.sh: Secret $namespace/$secret" >&2
kubectl create secret tls "$secret" -n "$namespace" --cert="$dir/tls.crt" --key="$dir/tls.key" \
  --dry-run=client -o yaml | kubectl apply --server-side --force-conflicts --field-manager=webhook-cert.sh -f - >&2

echo "webhook-cert.sh: caBundle of CRD $crd" >&2
bundle="$(base64 <"$dir/ca.crt" | tr -d '\n')"
kubectl patch crd "$crd" --type=json \
  -p "[{\"op\":\"add\",\"path\":\"/spec/conversion/webhook/clientConfig/caBundle\",\"value\":\"$bundle\"}]" >&2

echo "webhook-cert.sh: done; check with: kubectl get gpujobs.v2.gpujob.dev -A" >&2
