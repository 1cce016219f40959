{{/*
How KEDA's operator proves itself to the Sentinel (keda.auth.mode; mutual TLS for the
external-push trigger): the mode and the names of the objects that carry the credentials.
*/}}

{{/* "true" when KEDA authenticates with a bound service-account token, "" otherwise. */}}
{{- define "astro-agent.boundTokenMode" -}}
{{- if eq .Values.keda.auth.mode "boundServiceAccountToken" -}}true{{- end -}}
{{- end -}}

{{/* "true" when people read workers with their own Kubernetes token (sentinel.kubernetes.userAccess;
the Sentinel checks access in the release namespace, so it needs sentinel.kubernetes.enabled). */}}
{{- define "astro-agent.sentinelUserAccess" -}}
{{- $k := .Values.sentinel.kubernetes -}}
{{- if and .Values.sentinel.enabled $k.enabled $k.userAccess -}}true{{- end -}}
{{- end -}}

{{/* The chart-made Secret holding KEDA's static bearer token for the Sentinel. */}}
{{- define "astro-agent.kedaTokenSecretName" -}}
{{- printf "%s-keda-sentinel-token" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{- define "astro-agent.triggerAuthName" -}}
{{- printf "%s-keda-sentinel" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{/*
Objects that live outside the release namespace (KEDA's namespace, cluster scope) carry the
release namespace in their name, so two installs with the same prefix do not collide.
*/}}
{{- define "astro-agent.kedaIdentityName" -}}
{{- $a := .Values.keda.auth.boundServiceAccountToken -}}
{{- if $a.serviceAccountName -}}
{{- $a.serviceAccountName -}}
{{- else -}}
{{- printf "%s-%s-keda-sentinel" (include "astro-agent.prefix" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "astro-agent.kedaClusterObjectNamespace" -}}
{{- default .Values.keda.namespace .Values.keda.clusterObjectNamespace -}}
{{- end -}}

{{- define "astro-agent.tokenReviewRoleName" -}}
{{- printf "%s-%s-sentinel-tokenreview" (include "astro-agent.prefix" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret with the Sentinel's serving certificate and the CA it trusts for clients. */}}
{{- define "astro-agent.externalScalerServerSecretName" -}}
{{- default (printf "%s-sentinel-external-scaler-tls" (include "astro-agent.prefix" .)) .Values.sentinel.externalScaler.tls.serverSecret -}}
{{- end -}}

{{/* The Secret with KEDA's client certificate and the CA of the Sentinel's certificate. */}}
{{- define "astro-agent.externalScalerClientSecretName" -}}
{{- default (printf "%s-keda-external-scaler-tls" (include "astro-agent.prefix" .)) .Values.sentinel.externalScaler.tls.clientSecret -}}
{{- end -}}

{{- define "astro-agent.externalPushAuthName" -}}
{{- printf "%s-keda-sentinel-external-push" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{- define "astro-agent.podPatchPolicyName" -}}
{{- printf "%s-%s-sentinel-pod-patch" (include "astro-agent.prefix" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret with the CA that signs both certificates of the external scaler port (ca.crt,
ca.key), made by `ensure-secrets` and mounted nowhere. */}}
{{- define "astro-agent.externalScalerCaSecretName" -}}
{{- printf "%s-sentinel-external-scaler-ca" (include "astro-agent.prefix" .) -}}
{{- end -}}

{{/*
What the pre-install/pre-upgrade Job (`astro-sentinel ensure-secrets`) makes, as JSON: the token
Secret's name when KEDA's static token is neither given nor in an existing Secret, and whether
the external scaler's certificates are the chart's own. Rendering stays free of randomness, so
`helm template` gives the same output every time (GitOps).
*/}}
{{- define "astro-agent.ensuredSecrets" -}}
{{- $st := .Values.keda.auth.staticToken -}}
{{- $token := "" -}}
{{- if and .Values.sentinel.enabled (eq .Values.keda.auth.mode "staticToken") (not $st.value) (not $st.existingSecret.name) -}}
{{- $token = include "astro-agent.kedaTokenSecretName" . -}}
{{- end -}}
{{- $t := .Values.sentinel.externalScaler.tls -}}
{{- if and (or $t.serverSecret $t.clientSecret) (not (and $t.serverSecret $t.clientSecret)) -}}
{{- fail "sentinel.externalScaler.tls: set both serverSecret and clientSecret, or neither (the chart then makes them)" -}}
{{- end -}}
{{- $tls := and .Values.sentinel.enabled (include "astro-agent.externalScalerEnabled" .) (not $t.serverSecret) -}}
{{- toJson (dict "token" $token "tls" (not (not $tls))) -}}
{{- end -}}

{{- define "astro-agent.ensureSecretsName" -}}
{{- printf "%s-sentinel-ensure-secrets" (include "astro-agent.prefix" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
