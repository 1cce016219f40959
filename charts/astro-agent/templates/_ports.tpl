{{/*
Where the Sentinel answers: its ports and the in-cluster URL KEDA's operator calls.
*/}}

{{/* The gRPC port of the Sentinel's external scaler API. */}}
{{- define "astro-agent.externalScalerPort" -}}39093{{- end -}}

{{/* In-cluster base URL of the Sentinel Service, as KEDA's operator reaches it. */}}
{{- define "astro-agent.sentinelUrl" -}}
{{- printf "http://%s.%s.svc.%s:39092" (include "astro-agent.sentinelName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}
