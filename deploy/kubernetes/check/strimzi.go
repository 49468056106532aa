package check

// The fields of Strimzi's kafka.strimzi.io/v1beta2 KafkaTopic and KafkaMirrorMaker2 that
// the manifests use, named as in Strimzi's CRDs (strimzi-kafka-operator,
// packaging/install/cluster-operator/04x-Crd-*.yaml). Strimzi publishes no Go types: a
// field spelled wrong or placed wrong is an unknown field here, as it is to the API
// server's structural schema.

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

type KafkaTopic struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		TopicName  string            `json:"topicName,omitempty"`
		Partitions int32             `json:"partitions"`
		Replicas   int32             `json:"replicas"`
		Config     map[string]string `json:"config,omitempty"`
	} `json:"spec"`
}

type SecretCertificate struct {
	SecretName  string `json:"secretName"`
	Certificate string `json:"certificate"`
}

type MM2Cluster struct {
	Alias            string `json:"alias"`
	BootstrapServers string `json:"bootstrapServers"`
	TLS              *struct {
		TrustedCertificates []SecretCertificate `json:"trustedCertificates"`
	} `json:"tls,omitempty"`
	Authentication *struct {
		Type           string `json:"type"`
		Username       string `json:"username"`
		PasswordSecret struct {
			SecretName string `json:"secretName"`
			Password   string `json:"password"`
		} `json:"passwordSecret"`
	} `json:"authentication,omitempty"`
	Config map[string]any `json:"config,omitempty"`
}

type MM2Connector struct {
	TasksMax int32          `json:"tasksMax,omitempty"`
	Config   map[string]any `json:"config,omitempty"`
}

type MM2Mirror struct {
	SourceCluster       string        `json:"sourceCluster"`
	TargetCluster       string        `json:"targetCluster"`
	TopicsPattern       string        `json:"topicsPattern,omitempty"`
	GroupsPattern       string        `json:"groupsPattern,omitempty"`
	SourceConnector     *MM2Connector `json:"sourceConnector,omitempty"`
	HeartbeatConnector  *MM2Connector `json:"heartbeatConnector,omitempty"`
	CheckpointConnector *MM2Connector `json:"checkpointConnector,omitempty"`
}

type KafkaMirrorMaker2 struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Version        string       `json:"version"`
		Replicas       int32        `json:"replicas"`
		ConnectCluster string       `json:"connectCluster"`
		Clusters       []MM2Cluster `json:"clusters"`
		Mirrors        []MM2Mirror  `json:"mirrors"`
	} `json:"spec"`
}
