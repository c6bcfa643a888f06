#!/usr/bin/env bash
# The conversion webhook's certificate for a cluster without cert-manager:
#
# 1. makes a CA and a serving certificate for the webhook Service's DNS names
#    (gpujob-operator-webhook.gpujob-system.svc[.cluster.local]) with openssl,
# 2. puts the CA into the CRD's spec.conversion.webhook.clientConfig.caBundle (when the
#    CRD exists and calls this Service, or a URL),
# 3. creates or replaces the kubernetes.io/tls Secret gpujob-operator-webhook-tls in
#    gpujob-system (the operator re-reads it without a restart), with the same bundle as
#    ca.crt: the Helm chart copies ca.crt into the CRD on every install and upgrade, so
#    the Secret is the one place the CA lives and no chart value has to follow it.
#
# Run it before or after the install (the pods wait for the Secret; before a kustomize
# install, run it again once the CRD is applied), and again before the certificate
# expires (DAYS, default 365) to rotate. A rotation has no outage: the new CA is added to
# the caBundle beside the one in use first, and only then is the Secret replaced, so the
# API server trusts both the certificate a replica still serves (the kubelet updates
# Secret volumes within a minute or two) and the new one. The bundle keeps the new CA
# and the one before it, in the CRD and in ca.crt alike (a helm upgrade during those
# minutes keeps trusting both).
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

# The bundle: the new CA, and the CA that signed what the replicas serve now (the first
# of the Secret's ca.crt; of the CRD's caBundle for a Secret this script made before it
# wrote ca.crt), so both old and new certificates verify.
first_ca() { base64 -d 2>/dev/null | awk '/-----BEGIN CERTIFICATE-----/{n++} n==1'; }
kubectl get secret "$secret" -n "$namespace" -o jsonpath='{.data.ca\.crt}' 2>/dev/null \
  | first_ca >"$dir/ca-previous.crt" || true
if [[ ! -s "$dir/ca-previous.crt" ]]; then
  kubectl get crd "$crd" -o jsonpath='{.spec.conversion.webhook.clientConfig.caBundle}' 2>/dev/null \
    | first_ca >"$dir/ca-previous.crt" || true
fi
cat "$dir/ca.crt" >"$dir/ca-bundle.crt"
if [[ -s "$dir/ca-previous.crt" ]] && openssl x509 -noout -in "$dir/ca-previous.crt" 2>/dev/null; then
  cat "$dir/ca-previous.crt" >>"$dir/ca-bundle.crt"
fi
bundle="$(base64 <"$dir/ca-bundle.crt" | tr -d '\n')"

# The CRD before the Secret, so the API server trusts the new CA before any replica
# serves a certificate it signed; only when it calls this install's webhook (one install
# of a cluster serves it: another's CA there would fail every conversion).
if crd_error="$(kubectl get crd "$crd" -o name 2>&1 >/dev/null)"; then
  strategy="$(kubectl get crd "$crd" -o jsonpath='{.spec.conversion.strategy}')"
  url="$(kubectl get crd "$crd" -o jsonpath='{.spec.conversion.webhook.clientConfig.url}')"
  called="$(kubectl get crd "$crd" -o jsonpath='{.spec.conversion.webhook.clientConfig.service.namespace}/{.spec.conversion.webhook.clientConfig.service.name}')"
  if [[ "$strategy" != "Webhook" ]]; then
    # The v1-only CRD (gpujob-operator crd --v1-only): no webhook, no caBundle to hold.
    echo "webhook-cert.sh: CRD $crd has no conversion webhook (strategy '${strategy:-None}'): nothing to trust there yet; run this again after the CRD serving v2 is applied" >&2
  elif [[ "$called" == "$namespace/$service" || -n "$url" ]]; then
    # A URL: the operator run outside the cluster, no other install's Service to spare.
    echo "webhook-cert.sh: caBundle of CRD $crd (the new CA, and the one in use)" >&2
    kubectl patch crd "$crd" --type=json \
      -p "[{\"op\":\"add\",\"path\":\"/spec/conversion/webhook/clientConfig/caBundle\",\"value\":\"$bundle\"}]" >&2
  else
    echo "webhook-cert.sh: CRD $crd calls the webhook Service '$called', not $namespace/$service: its caBundle is left alone" >&2
  fi
elif [[ "$crd_error" == *NotFound* ]]; then
  echo "webhook-cert.sh: CRD $crd is not installed yet: the Helm chart copies the Secret's ca.crt into it at install; with kustomize, run this again after applying deploy/crd" >&2
elif [[ "$crd_error" == *Forbidden* || "$crd_error" == *forbidden* ]]; then
  # A namespaced team may not read CRDs: its Secret still gets written (the chart's
  # release that serves the CRD's webhook copies ca.crt in at its install or upgrade).
  echo "webhook-cert.sh: reading CRD $crd is forbidden to this user: its caBundle is left alone; whoever installs the CRD's webhook puts this Secret's ca.crt there: $crd_error" >&2
else
  echo "webhook-cert.sh: reading CRD $crd failed, nothing changed: $crd_error" >&2
  exit 1
fi

echo "webhook-cert.sh: Secret $namespace/$secret (tls.crt, tls.key, and the bundle as ca.crt)" >&2
kubectl create secret generic "$secret" -n "$namespace" --type=kubernetes.io/tls \
  --from-file=tls.crt="$dir/tls.crt" --from-file=tls.key="$dir/tls.key" \
  --from-file=ca.crt="$dir/ca-bundle.crt" \
  --dry-run=client -o yaml | kubectl apply --server-side --force-conflicts --field-manager=webhook-cert.sh -f - >&2

expires="$(openssl x509 -noout -enddate -in "$dir/tls.crt")"
echo "webhook-cert.sh: done; the certificate is valid until ${expires#notAfter=}: renew it before then (GpuJobConversionCertificateExpiresSoon fires 14 days before; \`$0 --check\` tells)" >&2
echo "webhook-cert.sh: Helm installs: nothing to set (install and upgrade copy the Secret's ca.crt into the CRD); only renders without a cluster (helm template, Argo CD) need webhook.caBundle set to it: kubectl get secret $secret -n $namespace -o jsonpath='{.data.ca\.crt}'" >&2
echo "webhook-cert.sh: check with: kubectl get gpujobs.v2.gpujob.dev -A" >&2
