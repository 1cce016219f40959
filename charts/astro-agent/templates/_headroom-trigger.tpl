{{/*
The headroom trigger (keda.overprovisionSlots above 0): the Sentinel's `scalingSlots`, the
larger of the backlog and the pre-warm's expected slots plus the slots kept free while the pool
has work, against the same `syncSlots` per replica. It is never below the other triggers'
values, so the HPA's largest proposal is its own: the pool runs ceil(scalingSlots / syncSlots)
workers, and goes to zero when idle (no work, no headroom). Its activation value is the backlog
trigger's plus the headroom, so the work alone wakes a pool at zero, as without headroom (with
work, scalingSlots is that work plus the headroom). Only with the metrics-api trigger:
with external-push the Sentinel's gRPC metric includes the headroom already. Same URL and
authentication as the backlog trigger.
Arguments: dict "root" (the chart context), "w" (the resolved worker), "url", "bound".
*/}}
{{- define "astro-agent.headroomTrigger" -}}
{{- if and (gt (int .w.keda.overprovisionSlots) 0) (ne .w.keda.trigger "external-push") -}}
{{- include "astro-agent.sentinelTrigger" (dict "root" .root "url" .url "bound" .bound "name" "headroom" "metricType" "AverageValue" "valueLocation" "scalingSlots" "target" (int .w.syncSlots) "activation" (addf (float64 .w.keda.activationTargetValue) .w.keda.overprovisionSlots)) }}
{{- end }}
{{- end -}}
