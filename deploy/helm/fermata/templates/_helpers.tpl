{{/* The release's base name. */}}
{{- define "fermata.name" -}}
{{- printf "%s-fermata" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries; `role` names the Fermata role. */}}
{{- define "fermata.labels" -}}
app.kubernetes.io/name: fermata
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "fermata.selector" -}}
app.kubernetes.io/name: fermata
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "fermata.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "fermata.secretName" -}}
{{- if .Values.clusterSecret.existingSecret -}}
{{ .Values.clusterSecret.existingSecret }}
{{- else -}}
{{ include "fermata.name" . }}-cluster
{{- end -}}
{{- end -}}

{{/* The scheduler addresses nodes are given: the primary, then the standby. */}}
{{- define "fermata.schedulers" -}}
{{ include "fermata.name" . }}-scheduler:7300
{{- if .Values.scheduler.standby.enabled -}}
,{{ include "fermata.name" . }}-standby:7300
{{- end -}}
{{- end -}}

{{/*
The cluster secret as the binary wants it: a file only its owner can read.
A Secret volume is root's (or group-readable with fsGroup), so an init
container copies it into a memory-backed emptyDir as the pod's user, mode 0400.
*/}}
{{- define "fermata.secretInit" -}}
- name: cluster-secret
  image: {{ include "fermata.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["/bin/sh", "-c", "cp /etc/fermata/secret-src/secret /var/run/fermata/cluster.secret && chmod 0400 /var/run/fermata/cluster.secret"]
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
  volumeMounts:
    - name: secret-src
      mountPath: /etc/fermata/secret-src
      readOnly: true
    - name: secret
      mountPath: /var/run/fermata
{{- end -}}

{{- define "fermata.secretVolumes" -}}
- name: secret-src
  secret:
    secretName: {{ include "fermata.secretName" . }}
    defaultMode: 0440
- name: secret
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}

{{- define "fermata.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
{{- end -}}

{{- define "fermata.env" -}}
- name: FERMATA_CLUSTER_SECRET_FILE
  value: /var/run/fermata/cluster.secret
- name: FERMATA_LOG
  value: {{ .Values.logLevel | quote }}
{{- end -}}
