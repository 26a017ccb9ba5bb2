{{/* Names: <fullname>-<component>; release `cacheroute` gives the kustomize tree's names. */}}
{{- define "cacheroute.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cacheroute.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: (list $ "planner"). */}}
{{- define "cacheroute.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ printf "%s-%s" (include "cacheroute.fullname" $) (index . 1) }}
app.kubernetes.io/instance: {{ $.Release.Name }}
{{- end -}}

{{/* Labels of every object; with a component, its selector labels too. */}}
{{- define "cacheroute.labels" -}}
{{- $ := index . 0 -}}
{{- if gt (len .) 1 -}}
{{ include "cacheroute.selectorLabels" . }}
app.kubernetes.io/component: {{ index . 1 }}
{{- else -}}
app.kubernetes.io/instance: {{ $.Release.Name }}
{{- end }}
app.kubernetes.io/part-of: cacheroute
app.kubernetes.io/managed-by: {{ $.Release.Service }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
helm.sh/chart: {{ include "cacheroute.chart" $ }}
{{- with $.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "cacheroute.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}

{{/* The Secret a group of secret references reads: its own existingSecret, else the shared one. */}}
{{- define "cacheroute.secret" -}}
{{- $ := index . 0 -}}
{{- $name := default $.Values.secrets.existingSecret (index . 1) -}}
{{- required "set secrets.existingSecret (or the group's existingSecret) to a Secret you created: the chart creates none (README.md, \"The Secret\")" $name -}}
{{- end -}}
{{- define "cacheroute.redisSecret" -}}{{ include "cacheroute.secret" (list . .Values.redis.auth.existingSecret) }}{{- end -}}
{{- define "cacheroute.signingSecret" -}}{{ include "cacheroute.secret" (list . .Values.signing.existingSecret) }}{{- end -}}
{{- define "cacheroute.snapshotSigningSecret" -}}{{ include "cacheroute.secret" (list . .Values.snapshotSigning.existingSecret) }}{{- end -}}
{{- define "cacheroute.tokenSecret" -}}{{ include "cacheroute.secret" (list . .Values.grpcTokens.existingSecret) }}{{- end -}}

{{- define "cacheroute.poolName" -}}
{{- default (printf "%s-pool" (include "cacheroute.fullname" .)) .Values.inferencePool.name -}}
{{- end -}}

{{/* A ConfigMap's data: the chart's own keys win over the user's config map. */}}
{{- define "cacheroute.configData" -}}
{{- $data := merge (index . 0) (index . 1) -}}
{{- range $k, $v := $data }}
{{ $k }}: {{ toString $v | quote }}
{{- end }}
{{- end -}}

{{/* The pod and container security settings every CacheRoute container runs with. */}}
{{- define "cacheroute.podSecurityContext" -}}
securityContext: {runAsNonRoot: true, runAsUser: 10001, fsGroup: 10001}
{{- end -}}
{{- define "cacheroute.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end -}}

{{/* nodeSelector, tolerations and affinity of one component's values. */}}
{{- define "cacheroute.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The public key volume of the routers (gateway, picker). */}}
{{- define "cacheroute.plannerKeyVolume" -}}
- name: planner-key
  secret:
    secretName: {{ include "cacheroute.signingSecret" . }}
    defaultMode: 0444
    items:
      - {key: {{ .Values.signing.publicKeyKey | quote }}, path: planner-signing-key.pub.pem}
{{- end -}}
