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
