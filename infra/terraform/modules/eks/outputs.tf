output "cluster_name" {
  description = "EKS cluster name."
  value       = aws_eks_cluster.this.name
}

output "cluster_endpoint" {
  description = "EKS API endpoint."
  value       = aws_eks_cluster.this.endpoint
}

output "cluster_ca" {
  description = "Base64 cluster CA certificate."
  value       = aws_eks_cluster.this.certificate_authority[0].data
}

output "cluster_security_group_id" {
  description = "Security group EKS created for the cluster (nodes and control plane)."
  value       = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
}

output "workload_role_arns" {
  description = "IRSA role ARN per service account (ray, mlflow, cluster-autoscaler)."
  value       = { for k, r in aws_iam_role.workload : k => r.arn }
}

output "workload_role_names" {
  description = "IRSA role name per service account (for policies attached elsewhere)."
  value       = { for k, r in aws_iam_role.workload : k => r.name }
}
