{{/* Names: <release>-eosink unless the release is already called so; 63 characters at most (DNS labels). */}}
{{- define "eosink.fullname" -}}
{{- if contains "eosink" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-eosink" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "eosink.headless" -}}
{{- printf "%s-workers" (include "eosink.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eosink.selectorLabels" -}}
app.kubernetes.io/name: eosink
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "eosink.labels" -}}
{{ include "eosink.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "eosink.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "eosink.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "eosink.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "eosink.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "eosink.fullname" .)) -}}
{{- end -}}

{{- define "eosink.hasSecrets" -}}
{{- if or .Values.secrets.existingSecret .Values.secrets.files }}true{{ end -}}
{{- end -}}

{{/*
Checks values.schema.json cannot express; each failure names the value and what to write instead.
A connector is JSON text (what `eosink connectors apply` reads) or the same as YAML; as text it must
parse and hold a "name" and a "config" object, and its name must be the key (the ConfigMap's file).
*/}}
{{/* The addresses the workers use: the values, else (demo.enabled) the demo servers'. */}}
{{- define "eosink.zookeeper" -}}
{{- if and .Values.demo.enabled (not (trim .Values.zookeeper)) -}}
{{- printf "%s-demo-zookeeper:2181" (include "eosink.fullname" .) -}}
{{- else -}}
{{- .Values.zookeeper -}}
{{- end -}}
{{- end -}}

{{- define "eosink.kafka" -}}
{{- if and .Values.demo.enabled (not (trim .Values.kafka.bootstrapServers)) -}}
{{- printf "%s-demo-kafka:9092" (include "eosink.fullname" .) -}}
{{- else -}}
{{- .Values.kafka.bootstrapServers -}}
{{- end -}}
{{- end -}}

{{- define "eosink.validate" -}}
{{- if not (trim (include "eosink.zookeeper" .)) }}
{{- fail "zookeeper is required: the ZooKeeper connect string the workers coordinate through, e.g. --set zookeeper=zk-0.zk:2181,zk-1.zk:2181" }}
{{- end }}
{{- if not (trim (include "eosink.kafka" .)) }}
{{- fail "kafka.bootstrapServers is required: the Kafka bootstrap servers, e.g. --set kafka.bootstrapServers=kafka:9092" }}
{{- end }}
{{- if lt (int .Values.replicas) 1 }}
{{- fail (printf "replicas must be at least 1 (got %v): a cluster without workers delivers nothing" .Values.replicas) }}
{{- end }}
{{- range $key, $raw := .Values.connectors }}
{{- $doc := include "eosink.connectorDoc" (dict "key" $key "raw" $raw) | fromJson }}
{{- if not (kindIs "map" $doc.config) }}
{{- fail (printf "connectors.%s: needs a \"config\" object (the connector's settings)" $key) }}
{{- end }}
{{- if ne (toString $doc.name) (toString $key) }}
{{- fail (printf "connectors.%s: its \"name\" is %q; name the entry after the connector (connectors.%v)" $key (toString $doc.name) $doc.name) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* One connector's JSON: text as written (validated), a mapping as compact JSON; fails naming the entry when its text is not JSON. */}}
{{- define "eosink.connectorDoc" -}}
{{- if kindIs "string" .raw -}}
{{- $doc := fromJson .raw -}}
{{- if or (hasKey $doc "Error") (not (regexMatch "^\\s*\\{" .raw)) -}}
{{- fail (printf "connectors.%s is not valid JSON (%s): write the connector's JSON document as a string, or the same as YAML" .key (get $doc "Error" | default "not an object")) -}}
{{- end -}}
{{- trim .raw -}}
{{- else if kindIs "map" .raw -}}
{{- toJson .raw -}}
{{- else -}}
{{- fail (printf "connectors.%s must be the connector's JSON text or a mapping, not %s" .key (kindOf .raw)) -}}
{{- end -}}
{{- end -}}
