{{/*
The ports the agent and the Sentinel listen on, defined once: the containers, their listen
addresses, the Services, KEDA's trigger addresses and NOTES all read them here, so they cannot
drift apart. They are the binaries' own defaults (--listen) and what the images EXPOSE.
*/}}

{{/* The agent's admin HTTP server: /metrics, /healthz and /readyz. */}}
{{- define "astro-agent.agentAdminPort" -}}39091{{- end -}}

{{/* The Sentinel's HTTP API: /v1/workers (KEDA's metrics-api trigger), /metrics, /healthz, /readyz. */}}
{{- define "astro-agent.sentinelApiPort" -}}39092{{- end -}}

{{/* The gRPC port of the Sentinel's external scaler API. */}}
{{- define "astro-agent.externalScalerPort" -}}39093{{- end -}}

{{/* In-cluster base URL of the Sentinel Service, as KEDA's operator reaches it. */}}
{{- define "astro-agent.sentinelUrl" -}}
{{- printf "http://%s.%s.svc.%s:%s" (include "astro-agent.sentinelName" .) .Release.Namespace .Values.clusterDomain (include "astro-agent.sentinelApiPort" .) -}}
{{- end -}}
