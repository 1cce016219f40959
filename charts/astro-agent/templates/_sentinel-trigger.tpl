{{/*
A KEDA metrics-api trigger on a worker's answer from the Sentinel (`GET /v1/workers/<name>`): the
backlog trigger and the optional ones beside it differ only in the field they read, their name,
target and activation; URL and authentication are the same for all.
Arguments: dict "root" (the chart context), "url", "bound" (KEDA's bound-token identity), "name",
"metricType", "valueLocation", "target", and "activation" (left out when empty).
*/}}
{{- define "astro-agent.sentinelTrigger" -}}
- type: metrics-api
  name: {{ .name }}
  metricType: {{ .metricType }}
  metadata:
    url: {{ .url | quote }}
    format: json
    valueLocation: {{ .valueLocation }}
    targetValue: {{ toString .target | quote }}
    {{- if ne (toString .activation) "" }}
    activationTargetValue: {{ toString .activation | quote }}
    {{- end }}
    authModes: bearer
  authenticationRef:
    {{- if .bound }}
    kind: ClusterTriggerAuthentication
    name: {{ include "astro-agent.kedaIdentityName" .root }}
    {{- else }}
    kind: TriggerAuthentication
    name: {{ include "astro-agent.triggerAuthName" .root }}
    {{- end }}
{{- end -}}
