{{/*
The pre-warm trigger: the slots scheduled runs about to start are expected to need (the
Sentinel's `expectedSlots`, 0 outside a pre-warm window), against the same `syncSlots` per
replica as the backlog trigger. The HPA takes the largest proposal, so the pool follows
max(backlog, expectedSlots), never their sum; either one above the activation value wakes a pool
at zero. Only with the metrics-api trigger: with external-push the Sentinel's gRPC metric is
that max already. Same URL and authentication as the backlog trigger.
Arguments: dict "root" (the chart context), "w" (the resolved worker), "url", "bound".
*/}}
{{- define "astro-agent.preWarmTrigger" -}}
{{- if and .w.preWarm.enabled (ne .w.keda.trigger "external-push") -}}
{{- include "astro-agent.sentinelTrigger" (dict "root" .root "url" .url "bound" .bound "name" "pre-warm" "metricType" "AverageValue" "valueLocation" "expectedSlots" "target" (int .w.syncSlots) "activation" .w.keda.activationTargetValue) }}
{{- end }}
{{- end -}}
