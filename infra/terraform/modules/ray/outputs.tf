output "head_service" {
  description = "ClusterIP service of the Ray head (dashboard/Jobs 8265, client 10001)."
  value       = "${var.cluster_name}-head-svc.${var.namespace}.svc"
}

output "token_secret" {
  description = "Kubernetes secret holding the Ray auth token (key: token)."
  value       = kubernetes_secret_v1.ray_token.metadata[0].name
}
