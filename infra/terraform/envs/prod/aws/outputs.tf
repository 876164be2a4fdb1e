# Read by ../k8s through terraform_remote_state; none of them is a secret.
output "region" {
  description = "AWS region."
  value       = var.region
}

output "namespace" {
  description = "Kubernetes namespace the IRSA roles trust."
  value       = var.namespace
}

output "cluster_name" {
  description = "EKS cluster (aws eks update-kubeconfig --name ...)."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "EKS API endpoint (private unless public_api_cidrs is set)."
  value       = module.eks.cluster_endpoint
}

output "cluster_ca" {
  description = "Base64 cluster CA certificate."
  value       = module.eks.cluster_ca
}

output "bucket" {
  description = "Project bucket (SIEVE_STORAGE=s3://BUCKET)."
  value       = module.storage.bucket
}

output "workload_role_arns" {
  description = "IRSA role ARNs for the ray, mlflow and cluster-autoscaler service accounts."
  value       = module.eks.workload_role_arns
}

output "db_secret_arn" {
  description = "Secrets Manager secret the MLflow pod reads its database credential from."
  value       = module.mlflow_db.db_secret_arn
}
