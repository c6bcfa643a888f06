#!/usr/bin/env bash
# The conversion webhook's certificate for a cluster without cert-manager:
#
# 1. makes a CA and a serving certificate for the webhook Service's DNS names
#    (gpujob-operator-webhook.gpujob-system.svc[.cluster.local]) with openssl,
# 2. creates or replaces the kubernetes.io/tls Secret gpujob-operator-webhook-tls in
#    gpujob-system (the operator re-reads it without a restart),
# 3. puts the CA into the CRD's spec.conversion.webhook.clientConfig.caBundle.
#
# Run it after the install (the pods wait for the Secret), and again before the
# certificate expires (DAYS, default 365) to rotate. A rotation has no outage: the new CA
# is added to the caBundle beside the one in use first, and only then is the Secret
# replaced, so the API server trusts both the certificate a replica still serves (the
# kubelet updates Secret volumes within a minute or two) and the new one. The bundle
# keeps the new CA and the one before it.
#
# Before it expires: every replica exports the served certificate's notAfter
# (gpujob_conversion_certificate_expiration_timestamp_seconds), the alert
# GpuJobConversionCertificateExpiresSoon fires 14 days before, and the replicas log a
# warning from 7 days before. `webhook-cert.sh --check` prints the Secret's expiry and
# exits 1 when it is less than WARN_DAYS (default 30) away, for a cron job or a pipeline.
#
# Uses the current kubectl context. NAMESPACE, SERVICE, SECRET, CRD and DAYS override
# the defaults (an install moved or renamed by an overlay or a Helm release: set them
# to its names); KEEP_DIR=dir keeps the files (CA key included) there instead of a
# temporary folder that is removed at the end.
set -euo pipefail

namespace="${NAMESPACE:-gpujob-system}"
service="${SERVICE:-gpujob-operator-webhook}"
secret="${SECRET:-gpujob-operator-webhook-tls}"
crd="${CRD:-gpujobs.gpujob.dev}"
days="${DAYS:-365}"
warn_days="${WARN_DAYS:-30}"

for tool in openssl kubectl base64; do
  command -v "$tool" >/dev/null || { echo "webhook-cert.sh: $tool is needed and not on PATH" >&2; exit 1; }
done

# When the certificate in the Secret expires: "notAfter=<date>", or nothing.
current_expiry() {
  kubectl get secret "$secret" -n "$namespace" -o jsonpath='{.data.tls\.crt}' 2>/dev/null \
    | base64 -d 2>/dev/null | openssl x509 -noout -enddate 2>/dev/null || true
}

if [[ "${1:-}" == "--check" ]]; then
  expiry="$(current_expiry)"
  if [[ -z "$expiry" ]]; then
    echo "webhook-cert.sh: no readable certificate in Secret $namespace/$secret" >&2
    exit 1
  fi
  if ! kubectl get secret "$secret" -n "$namespace" -o jsonpath='{.data.tls\.crt}' | base64 -d \
    | openssl x509 -noout -checkend $((warn_days * 86400)) >/dev/null; then
    echo "webhook-cert.sh: WARNING: $namespace/$secret expires within $warn_days days (${expiry#notAfter=}): run $0 to renew it" >&2
    exit 1
  fi
  echo "webhook-cert.sh: $namespace/$secret is valid until ${expiry#notAfter=}" >&2
  exit 0
elif [[ -n "${1:-}" ]]; then
  echo "usage: $0 [--check]" >&2
  exit 2
fi

if (( days < 30 )); then
  echo "webhook-cert.sh: WARNING: DAYS=$days leaves little time to renew; the alert fires 14 days before expiry" >&2
fi

if [[ -n "${KEEP_DIR:-}" ]]; then
  dir="$KEEP_DIR"
  mkdir -p "$dir"
else
  dir="$(mktemp -d)"
  trap 'rm -rf "$dir"' EXIT
fi

previous="$(current_expiry)"
[[ -n "$previous" ]] && echo "webhook-cert.sh: replacing the certificate of $namespace/$secret (${previous#notAfter=})" >&2

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

# The caBundle first: the new CA, and the first CA of the bundle in use (the one that
# signed what the replicas serve now), so both old and new certificates verify.
echo "webhook-cert.sh: caBundle of CRD $crd (the new CA, and the one in use)" >&2
kubectl get crd "$crd" -o jsonpath='{.spec.conversion.webhook.clientConfig.caBundle}' \
  | base64 -d 2>/dev/null | awk '/-----BEGIN CERTIFICATE-----/{n++} n==1' >"$dir/ca-previous.crt" || true
cat "$dir/ca.crt" >"$dir/ca-bundle.crt"
if [[ -s "$dir/ca-previous.crt" ]] && openssl x509 -noout -in "$dir/ca-previous.crt" 2>/dev/null; then
  cat "$dir/ca-previous.crt" >>"$dir/ca-bundle.crt"
fi
bundle="$(base64 <"$dir/ca-bundle.crt" | tr -d '\n')"
kubectl patch crd "$crd" --type=json \
  -p "[{\"op\":\"add\",\"path\":\"/spec/conversion/webhook/clientConfig/caBundle\",\"value\":\"$bundle\"}]" >&2

echo "webhook-cert.sh: Secret $namespace/$secret" >&2
kubectl create secret tls "$secret" -n "$namespace" --cert="$dir/tls.crt" --key="$dir/tls.key" \
  --dry-run=client -o yaml | kubectl apply --server-side --force-conflicts --field-manager=webhook-cert.sh -f - >&2

expires="$(openssl x509 -noout -enddate -in "$dir/tls.crt")"
echo "webhook-cert.sh: done; the certificate is valid until ${expires#notAfter=}: renew it before then (GpuJobConversionCertificateExpiresSoon fires 14 days before; \`$0 --check\` tells)" >&2
echo "webhook-cert.sh: Helm installs: set webhook.caBundle to the caBundle above (kubectl get crd $crd -o jsonpath='{.spec.conversion.webhook.clientConfig.caBundle}') so an upgrade keeps it" >&2
echo "webhook-cert.sh: check with: kubectl get gpujobs.v2.gpujob.dev -A" >&2
